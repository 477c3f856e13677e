"""In-process fuzzer: corrupted programs, random and palette schedule steps, and `verify`.

    python bench/fuzz.py [--cases N] [--seed S] [--verify F] [--show K] [--out DIR]

Every case is seeded (`--seed`, case number), so a finding reproduces. A case takes a
program of the corpus (the samples at small sizes, a GPT stack, every ```coco block of
the docs, a few update programs), corrupts its text with one of the mutations (or
leaves it as it is), and loads it. A program that loads then gets its schedule blocks
applied, and a few steps: steps the palette (`legal_steps`) offers, which must apply,
and random steps (any name, any arguments), which may fail with a schedule error. The
result is printed, printed back and parsed (it must equal itself) and, for a fraction
of the cases, compared with the original in the numpy reference (`verify`).

It prints cases per second and the counts of each outcome; a finding is an internal
error (an `InternalError` or any exception that is not a `CocovizError`), a step the
palette offered that failed, a printed program that does not parse back equal, or a
`verify` mismatch. The first few reproducers are printed (and, with `--out`, written
as files).
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from cocoviz import samples
from cocoviz.errors import CocovizError, MismatchError
from cocoviz.ir.lower import RanksOverride, load_file, load_program
from cocoviz.ir.nodes import Program, StepCall
from cocoviz.ir.printer import format_program
from cocoviz.ir.transforms import REGISTRY, as_transformation, from_call, legal_steps
from cocoviz.samples.gpt import gpt_stack

ROOT = Path(__file__).resolve().parent.parent

# Sizes at which the reference runs each sample quickly (as in tests/transforms_util.py).
SMALL = {
    "sgd": ({"N": 96}, "4"),
    "adam": ({"N": 96}, "4"),
    "lamb": ({"N": 96}, "4"),
    "megatron_mlp": ({"B": 2, "S": 16, "H": 16}, "4"),
    "megatron_attention_out": ({"B": 2, "S": 16, "H": 16}, "4"),
    "transformer_block": ({"B": 2, "S": 16, "H": 16}, "4"),
    "pipeline_stage": ({"B": 2, "S": 16, "H": 16}, "tp=2,pp=2"),
    "moe_routed": ({"P": 2, "R": 4, "T": 8, "E": 4, "C": 4, "H": 16, "F": 32}, "4"),
    "zero1_tp_mlp": ({"B": 16, "H": 16, "F": 32}, "dp=2,tp=2"),
}

# tests/programs at sizes the reference runs quickly (the rest load as written).
PROGRAMS_SMALL = {
    "seqpar_mlp.coco": {"B": 2, "S": 16, "H": 16},
    "hetero_stack.coco": {},
}

UPDATES = [
    # an updated input read by an allgather written after its update
    "ranks 4\ndim N = 64\ninput x : f32[N] sliced\ns1 = update(x, x * 2)\n"
    "s2 = allgather(x)\ns3 = s2 * 2\noutput s3, s1\n",
    # the sliced update of a replicated input and its gather, read by a later update
    "ranks 4\ndim N = 64\nparam lr: f32 = 0.1\ninput w : f32[N] replicated\n"
    "input m : f32[N] replicated\ninput g : f32[N] sliced\nwn = norm(w)\n"
    "m1 = update(m, 0.9 * slice(m) + g)\nm2 = allgather(m1)\n"
    "w1 = update(w, w - lr * m2 / wn)\noutput w1\n",
    # a long left-associative chain
    "ranks 4\ndim N = 64\ninput x : f32[N] local\ninput r : f32[N] replicated\n"
    "s = allreduce(+, x)\ny = " + " + ".join(["s"] + ["r"] * 300) + "\noutput y\n",
]

FENCE = re.compile(r"^```coco\n(.*?)^```\n", re.M | re.S)


def corpus() -> list[tuple[str, str]]:
    """(name, text) of every starting program; each one loads."""
    out: list[tuple[str, str]] = []
    for name in samples.names():
        defines, ranks = SMALL.get(name, ({}, "4"))
        p = load_file(samples.path(name), defines, RanksOverride.parse(ranks))
        out.append((name, format_program(p)))
    out.append(("gpt2", gpt_stack(2, h=64, s=16, b=2)))
    # the language's newer forms (transpose, axis reductions, constants, routing, grids)
    for path in sorted((ROOT / "tests" / "programs").glob("*.coco")):
        try:
            p = load_file(path, PROGRAMS_SMALL.get(path.name, {}), None)
        except CocovizError:
            continue
        out.append((path.stem, format_program(p)))
    for doc in ("language.md", "schedules.md"):
        path = ROOT / "docs" / doc
        if not path.exists():
            continue
        for k, m in enumerate(FENCE.finditer(path.read_text(encoding="utf-8"))):
            try:
                load_program(m.group(1), "doc.coco")
            except CocovizError:
                continue
            out.append((f"{doc}#{k}", m.group(1)))
    out.extend((f"update{k}", t) for k, t in enumerate(UPDATES))
    return out


# --- mutations of the text ---------------------------------------------------------------

TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9.]+(?:[eE][-+]?[0-9]+)?|#[^\n]*|\n|\s+|.")
NOISE = list("()[]{},;:=@+-*/<>!#.\n\t ") + ["\x00", "\x0b", "é", "漢", "\r", "1e400", "-"]
NUMBERS = ["0", "1", "2", "3", "-1", "7", "1e400", "1" * 60, "0" * 50 + "4", "4.5", "1e-400"]
WORDS = [
    "replicated", "local", "sliced", "sliced(0)", "sliced(1)", "sliced(-1)", "f16", "f32",
    "bf16", "i32", "i64", "allreduce", "allgather", "reducescatter", "update", "slice",
    "matmul", "send", "relu", "sum", "norm", "where", "dropout", "fused", "overlapped",
    "input", "output", "ranks", "dim", "schedule",
    "transpose", "permute", "mean", "amax", "amin", "zeros", "ones", "full", "iota",
    "gather", "scatter_add", "topk", "topk_indices", "capacity_slots", "alltoall",
    "keepdim", "dim", "over", "dp", "tp", "pp", "sliced(0, over=dp)", "local(over=dp)",
    "replicated(over=dp)", "sliced(over=dp)", "true", "false", "f32[N]", "i32",
]  # fmt: skip

# Statements of the newer forms, over names of the program (`{a}`, `{b}`: stages or
# inputs; `{d}`: a dim; `{k}`: a small or hostile integer).
NEW_FORMS = [
    "transpose({a}, {k}, 0)", "transpose({a}, 0, 1)", "transpose({a}, -1, -2)",
    "permute({a}, 1, 0)", "permute({a}, 0, 0)", "permute({a}, 2, 0, 1)", "permute({a})",
    "sum({a}, dim={k})", "mean({a}, dim=0, keepdim=true)", "amax({a}, dim=-1)",
    "amin({a}, dim={k}, keepdim=false)", "sum({a}, dim=0, keepdim=maybe)", "sum({a}, dim=)",
    "zeros(f32[{d}])", "ones(bf16[{d}, {d}])", "full(f16[{d}], {k})", "full(f32[{d}], 1e400)",
    "iota(i32[{d}])", "iota(f32[{d}, {d}], dim={k})", "zeros(f32[{k}])", "zeros({a})",
    "{a} * iota(f32[{d}], dim=0)", "where(iota(i32[{d}]) < {k}, {a}, full(f32[{d}], -1.0))",
    "gather({a}, {b}, dim={k})", "gather({a}, topk_indices({a}, {k}), dim=-1)",
    "scatter_add(f32[{d}], {b}, {a}, dim=0)", "scatter_add(f32[{d}, {d}], {a}, {b}, dim={k})",
    "topk({a}, {k})", "topk_indices({a}, {k}, dim=0)", "topk({a}, 0)",
    "capacity_slots({a}, {k}, {k})", "capacity_slots(topk_indices({a}, 2), 4, {k})",
    "allreduce(+, {a}, over=dp)", "allgather({a}, over=dp)", "reducescatter(+, {a}, over=dp)",
    "allreduce(max, {a}, over=pp)", "alltoall({a}, to=0, over=dp)", "slice({a}, over=dp)",
    "allreduce(+, {a}, over=ep)", "allreduce(+, {a}, over=tp)",
]  # fmt: skip

GRIDS = [
    "ranks dp=2, tp=2", "ranks tp=2, dp=2", "ranks dp=2, tp=2, pp=2", "ranks pp=2, tp=2",
    "ranks dp=4", "ranks dp=0, tp=4", "ranks dp=2, dp=2", "ranks dp=3, tp=" + "9" * 40,
    "ranks ep=2, tp=2", "ranks dp=2 tp=2", "ranks tp=1",
]  # fmt: skip
LAYOUTS_OVER = [
    "sliced(0, over=dp)", "sliced(over=dp)", "local(over=dp)", "replicated(over=dp)",
    "sliced(1) sliced(over=dp)", "sliced(-1, over=pp)", "local(over=zz)", "sliced(0, over=)",
]  # fmt: skip


def tokens(text: str) -> list[str]:
    return TOKEN.findall(text)


def delete_token(rng: random.Random, text: str) -> str:
    toks = tokens(text)
    for _ in range(rng.randint(1, 3)):
        if toks:
            del toks[rng.randrange(len(toks))]
    return "".join(toks)


def duplicate_token(rng: random.Random, text: str) -> str:
    toks = tokens(text)
    if not toks:
        return text
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(len(toks))
        toks.insert(i, toks[i])
    return "".join(toks)


def _name_positions(toks: list[str]) -> list[int]:
    return [i for i, t in enumerate(toks) if t[0].isalpha() or t[0] == "_"]


def swap_names(rng: random.Random, text: str) -> str:
    toks = tokens(text)
    names = _name_positions(toks)
    if not names:
        return text
    for _ in range(rng.randint(1, 2)):
        i, j = rng.choice(names), rng.choice(names)
        toks[i], toks[j] = toks[j], toks[i]
    return "".join(toks)


def random_bytes(rng: random.Random, text: str) -> str:
    chars = list(text)
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(chars) + 1)
        if rng.random() < 0.5:
            chars[i:i] = rng.choice(NOISE)
        elif chars:
            chars[min(i, len(chars) - 1)] = chr(rng.randrange(1, 0x250))
    return "".join(chars)


def truncate(rng: random.Random, text: str) -> str:
    return text[: rng.randrange(len(text) + 1)]


def replace_number(rng: random.Random, text: str) -> str:
    toks = tokens(text)
    nums = [i for i, t in enumerate(toks) if t[0].isdigit()]
    if nums:
        toks[rng.choice(nums)] = rng.choice(NUMBERS)
    return "".join(toks)


def replace_word(rng: random.Random, text: str) -> str:
    """A name becomes a layout, dtype, function or keyword (type and layout rules)."""
    toks = tokens(text)
    names = _name_positions(toks)
    if not names:
        return text
    for _ in range(rng.randint(1, 2)):
        toks[rng.choice(names)] = rng.choice(WORDS)
    return "".join(toks)


def move_line(rng: random.Random, text: str) -> str:
    """A statement moves (use before definition, reads around updates, groups)."""
    lines = text.split("\n")
    i = rng.randrange(len(lines))
    line = lines.pop(i)
    lines.insert(rng.randrange(len(lines) + 1), line)
    return "\n".join(lines)


def nest(rng: random.Random, text: str) -> str:
    """An operand becomes deeply nested (parentheses, calls or a long chain)."""
    toks = tokens(text)
    names = [i for i in _name_positions(toks) if i > 0 and toks[i - 1].strip() in ("=", "(", "+")]
    if not names:
        return text
    i = rng.choice(names)
    depth = rng.choice([10, 300, 2100, 5000])
    x = toks[i]
    toks[i] = rng.choice(
        [
            "(" * depth + x + ")" * depth,
            "relu(" * depth + x + ")" * depth,
            " + ".join([x] * depth),
            "-" * depth + x,
        ]
    )
    return "".join(toks)


def add_schedule(rng: random.Random, text: str) -> str:
    """A schedule block of random steps over the names in the text."""
    names = sorted({t for t in tokens(text) if t[0].isalpha() or t[0] == "_"}) or ["x"]
    steps = []
    for _ in range(rng.randint(1, 4)):
        args = [rng.choice(names) for _ in range(rng.choice([0, 1, 1, 2, 3]))]
        if rng.random() < 0.3:
            args.append(f"chunks={rng.choice(['0', '1', '2', '4', '3', '1' * 30])}")
        steps.append(f"  {rng.choice([*REGISTRY, 'nope'])}({', '.join(args)})")
    return text + "\nschedule fz {\n" + "\n".join(steps) + "\n}\n"


def new_form(rng: random.Random, text: str) -> str:
    """A statement of one of the newer forms over the program's names, made an output."""
    lines = text.split("\n")
    names = re.findall(r"^\s*([A-Za-z_]\w*)\s*=", text, re.M)
    names += re.findall(r"^\s*input\s+([A-Za-z_]\w*)", text, re.M)
    dims = re.findall(r"\b([A-Z]\w*)\s*=\s*\d", text) or ["4"]
    if not names:
        return text
    form = rng.choice(NEW_FORMS).format(
        a=rng.choice(names),
        b=rng.choice(names),
        d=rng.choice(dims),
        k=rng.choice(["0", "1", "2", "-1", "3", "8", "1" * 30]),
    )
    outs = [i for i, ln in enumerate(lines) if ln.lstrip().startswith("output")]
    at = outs[0] if outs and rng.random() < 0.9 else rng.randrange(len(lines) + 1)
    lines.insert(at, f"zz_new = {form}")
    if outs and rng.random() < 0.8:
        i = outs[0] + 1
        lines[i] = lines[i].split("#")[0].rstrip() + ", zz_new"
    return "\n".join(lines)


def grid(rng: random.Random, text: str) -> str:
    """The ranks line becomes a grid; a layout or a collective says `over=`."""
    r = rng.random()
    if r < 0.4:
        return re.sub(r"^ranks [^\n#]*", rng.choice(GRIDS), text, count=1, flags=re.M)
    if r < 0.7:
        layouts = list(re.finditer(r"\b(replicated|local|sliced(\(\s*-?\d+\s*\))?)", text))
        if layouts:
            m = rng.choice(layouts)
            return text[: m.start()] + rng.choice(LAYOUTS_OVER) + text[m.end() :]
        return text
    calls = list(re.finditer(r"\b(allreduce|allgather|reducescatter|slice|alltoall)\(", text))
    if not calls:
        return text
    m = rng.choice(calls)
    depth, i = 1, m.end()
    while i < len(text) and depth:
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        i += 1
    over = rng.choice([", over=dp", ", over=pp", ", over=tp", ", over=", ", over=dp, over=tp"])
    return text[: i - 1] + over + text[i - 1 :]


MUTATIONS: dict[str, Callable[[random.Random, str], str]] = {
    "none": lambda rng, text: text,
    "delete": delete_token,
    "duplicate": duplicate_token,
    "swap": swap_names,
    "bytes": random_bytes,
    "truncate": truncate,
    "number": replace_number,
    "word": replace_word,
    "move": move_line,
    "nest": nest,
    "schedule": add_schedule,
    "new_form": new_form,
    "grid": grid,
}


# --- steps -----------------------------------------------------------------------------


def random_step(rng: random.Random, p: Program) -> StepCall:
    """Any step name with arguments drawn from the program's names (and a few others)."""
    names = [s.name for s in p.stages] + [i.name for i in p.inputs]
    pool = names + [q.name for q in p.params] + ["nope", "_", "x"]
    name = rng.choice([*REGISTRY, *REGISTRY, "splitt", "fusee"])
    args = tuple(rng.choice(pool) for _ in range(rng.choice([0, 1, 1, 2, 2, 3])))
    kwargs: tuple[tuple[str, int], ...] = ()
    if rng.random() < 0.4:
        kwargs = ((rng.choice(["chunks", "chunks", "k"]), rng.choice([0, 1, 2, 3, 4, 8, 10**30])),)
    return StepCall(name, args, kwargs)


def palette_step(rng: random.Random, p: Program) -> str | None:
    """A step `legal_steps` offers as ok for a random stage or input, or None."""
    names = [s.name for s in p.stages] + [i.name for i in p.inputs]
    if not names:
        return None
    opts = [o for o in legal_steps(p, rng.choice(names)) if o.ok]
    return rng.choice(opts).step if opts else None


def sweep_palette(
    rng: random.Random,
    p: Program,
    steps: list[str],
    found: Callable[[str, str, BaseException | str], None],
) -> bool:
    """Every step the palette offers for a random stage or input applies to `p`; False
    after a finding."""
    names = [s.name for s in p.stages] + [i.name for i in p.inputs]
    if not names:
        return True
    target = rng.choice(names)
    try:
        options = legal_steps(p, target)
    except CocovizError:
        return True
    except Exception as err:  # noqa: BLE001
        found("internal", "palette", err)
        return False
    for o in options:
        if not o.ok:
            continue
        steps[:] = [f"(palette of {target}) {o.step}"]
        try:
            as_transformation(o.step).apply(p)
        except CocovizError as err:
            found("offered-step-failed", "apply", err.render())
            return False
        except Exception as err:  # noqa: BLE001
            found("internal", "apply", err)
            return False
    steps.clear()
    return True


# --- one case --------------------------------------------------------------------------


@dataclass
class Finding:
    kind: str  # internal, offered-step-failed, round-trip, mismatch
    phase: str
    what: str
    case: int
    source: str
    steps: list[str] = field(default_factory=list)
    trace: str = ""

    def signature(self) -> str:
        first = re.sub(r"'[^']*'", "'…'", self.what.splitlines()[0] if self.what else "")
        return f"{self.kind} in {self.phase}: {first[:120]}"

    def reproducer(self) -> str:
        steps = "".join(f"  {s}\n" for s in self.steps)
        return (
            f"# case {self.case}: {self.kind} in {self.phase}: {self.what}\n"
            f"# steps:\n{steps}--- source ---\n{self.source}"
        )


@dataclass
class Stats:
    cases: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    steps_applied: int = 0
    steps_refused: int = 0
    verified: int = 0
    findings: list[Finding] = field(default_factory=list)


def _internal(err: BaseException) -> bool:
    return not isinstance(err, CocovizError)


def run_case(
    case: int,
    seed: int,
    texts: list[tuple[str, str]],
    stats: Stats,
    verify_fraction: float,
) -> None:
    rng = random.Random(f"{seed}-{case}")
    name, text = texts[rng.randrange(len(texts))]
    source = text
    for _ in range(1 if rng.random() < 0.8 else 2):
        source = MUTATIONS[rng.choice(list(MUTATIONS))](rng, source)
    stats.cases += 1
    steps: list[str] = []

    def found(kind: str, phase: str, err: BaseException | str) -> None:
        what = err if isinstance(err, str) else f"{type(err).__name__}: {err}"
        trace = "" if isinstance(err, str) else traceback.format_exc()
        stats.findings.append(Finding(kind, phase, what, case, source, list(steps), trace))

    try:
        program = load_program(source, f"{name}.coco")
    except CocovizError:
        stats.outcomes["load: diagnostic"] += 1
        return
    except Exception as err:  # noqa: BLE001 - a finding
        stats.outcomes["load: internal"] += 1
        found("internal", "load", err)
        return
    stats.outcomes["load: ok"] += 1

    from cocoviz.schedule import apply_block

    for block in program.schedules:
        try:
            apply_block(program, block)
        except CocovizError:
            pass
        except Exception as err:  # noqa: BLE001
            steps[:] = [f"(schedule block {block.name})"]
            found("internal", "schedule block", err)
            return
    steps.clear()

    p = program
    if rng.random() < 0.3 and not sweep_palette(rng, p, steps, found):
        return
    for _ in range(rng.randint(1, 8)):
        r = rng.random()
        offered = None
        try:
            if r < 0.5:
                offered = palette_step(rng, p)
                if offered is None:
                    continue
                step_text = offered
                t = as_transformation(offered)
            else:
                call = random_step(rng, p)
                step_text = str(call)
                t = from_call(call)
        except CocovizError:
            stats.steps_refused += 1
            continue
        except Exception as err:  # noqa: BLE001
            found("internal", "palette" if r < 0.5 else "step", err)
            return
        steps.append(step_text)
        try:
            p = t.apply(p)
            stats.steps_applied += 1
        except CocovizError as err:
            stats.steps_refused += 1
            steps.pop()
            if offered is not None:
                found("offered-step-failed", "apply", err.render())
                return
        except Exception as err:  # noqa: BLE001
            found("internal", "apply", err)
            return

    try:
        text_out = format_program(p)
        again = load_program(text_out, f"{p.name}.coco")
        if again != p:
            found("round-trip", "print", "the printed program parses back different")
            return
    except CocovizError as err:
        found("round-trip", "print", err.render())
        return
    except Exception as err:  # noqa: BLE001
        found("internal", "print", err)
        return

    if p is not program and rng.random() < verify_fraction:
        from cocoviz.exec.verify import verify_programs

        try:
            report = verify_programs(program, p, seed=case, max_mem=256 << 20)
            stats.verified += 1
            if not report.ok:
                found("mismatch", "verify", report.format_report())
        except MismatchError as err:
            found("mismatch", "verify", err.render())
        except CocovizError:
            pass
        except Exception as err:  # noqa: BLE001
            found("internal", "verify", err)


def run(cases: int, seed: int = 0, verify_fraction: float = 0.1, start: int = 0) -> Stats:
    """Run cases `start` … `start + cases - 1`; returns the counts and findings."""
    texts = corpus()
    stats = Stats()
    for case in range(start, start + cases):
        run_case(case, seed, texts, stats, verify_fraction)
    return stats


def summarize(stats: Stats) -> Iterator[str]:
    yield f"outcomes: {dict(sorted(stats.outcomes.items()))}"
    yield (
        f"steps applied: {stats.steps_applied}, refused: {stats.steps_refused}; "
        f"verified: {stats.verified}"
    )
    kinds = Counter(f.kind for f in stats.findings)
    internal = kinds.get("internal", 0)
    yield f"internal errors: {internal}; findings by kind: {dict(kinds)}"
    by_sig = Counter(f.signature() for f in stats.findings)
    for sig, n in by_sig.most_common():
        yield f"  {n:5d}  {sig}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--start", type=int, default=0, help="first case number")
    ap.add_argument("--verify", type=float, default=0.1, help="fraction of cases verified")
    ap.add_argument("--show", type=int, default=3, help="reproducers to print")
    ap.add_argument("--out", metavar="DIR", help="write every reproducer into DIR")
    ap.add_argument("--trace", action="store_true", help="print tracebacks of findings")
    args = ap.parse_args()

    t0 = time.perf_counter()
    texts = corpus()
    stats = Stats()
    for case in range(args.start, args.start + args.cases):
        run_case(case, args.seed, texts, stats, args.verify)
        if (case - args.start + 1) % 1000 == 0:
            dt = time.perf_counter() - t0
            print(
                f"... {case - args.start + 1} cases, {(case - args.start + 1) / dt:.1f}/s, "
                f"{len(stats.findings)} findings",
                file=sys.stderr,
                flush=True,
            )
    dt = time.perf_counter() - t0
    print(f"{stats.cases} cases in {dt:.1f} s: {stats.cases / dt:.1f} cases/s (seed {args.seed})")
    for line in summarize(stats):
        print(line)
    shown: set[str] = set()
    for f in stats.findings:
        if len(shown) >= args.show:
            break
        if f.signature() in shown:
            continue
        shown.add(f.signature())
        print("\n" + f.reproducer())
        if args.trace and f.trace:
            print(f.trace)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        for f in stats.findings:
            (out / f"case{f.case}.coco").write_text(f.reproducer(), encoding="utf-8")
    sys.exit(1 if any(f.kind != "mismatch" for f in stats.findings) else 0)


if __name__ == "__main__":
    main()
