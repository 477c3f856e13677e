"""Prose that cannot drift: every performance claim in README.md, docs/*.md and the
samples' comments — a predicted time, a speedup, a winner, an algorithm — is a row of
`CLAIMS`, evaluated here against `cocoviz simulate --json` / `cocoviz tune --json` on the
hardware the sentence states.

A claim is a template and the values the model gives: the sentence, filled in, must be in
the file (whitespace aside), and a claim about a winner or an algorithm checks it too.
When the model changes, the test fails with the sentence as it should now read.

`test_every_claim_in_the_prose_is_in_the_table` finds the claims: every time
(`593 µs`, `8.55 ms`), speedup (`1.16×`, `1.18x`), bandwidth (`480 GB/s`), algorithm
(`NVLS`, `NVLink SHARP`) and verdict (`wins`, `loses`, `faster`, `slower`) in
the prose — outside the command outputs test_readme.py compares — must lie inside a
claim of the table, or inside a passage of `ELSEWHERE`, each with the test that checks it
or why it is not a prediction of the model (a cited measurement, a profile parameter).
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from cocoviz import samples
from cocoviz.cli import main
from cocoviz.timefmt import format_time

ROOT = Path(__file__).resolve().parent.parent

# --- the model's answers, through the CLI -----------------------------------------------------


@functools.cache
def _cli_json(*args: str) -> dict:  # type: ignore[type-arg]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main([*args, "--json"]) == 0, args
    return json.loads(out.getvalue())


def simulate(name: str, schedule: str | None = None, hw: str = "h100-dgx", *extra: str) -> dict:  # type: ignore[type-arg]
    args = ["simulate", name, "--hw", hw, *extra]
    if schedule:
        args += ["--schedule", schedule]
    return _cli_json(*args)


def tune(name: str, hw: str = "h100-dgx", *extra: str) -> dict:  # type: ignore[type-arg]
    return _cli_json("tune", name, "--hw", hw, *extra)


def t(seconds: float) -> str:
    return format_time(seconds)


def x(speedup: float, sign: str = "×") -> str:
    return f"{speedup:.2f}{sign}"


def speedup(name: str, schedule: str, hw: str = "h100-dgx", *extra: str) -> float:
    return float(simulate(name, schedule, hw, *extra)["summary"]["speedup"])


def first(name: str, hw: str = "h100-dgx", *extra: str) -> dict:  # type: ignore[type-arg]
    """`cocoviz tune`'s first row."""
    return tune(name, hw, *extra)["schedules"][0]


def algorithms(name: str, schedule: str | None = None, hw: str = "h100-dgx") -> set[str]:
    """The algorithm/protocol pairs of the collectives in `simulate`'s stage table."""
    found = set()
    for row in simulate(name, schedule, hw)["stages"]:
        m = re.search(r"\b(\w+/(?:Simple|LL128|LL))\b", row.get("detail", ""))
        if m:
            found.add(m[1])
    return found


def holds(condition: bool, what: str) -> str:
    """A claim's verdict: "" when the model agrees, else the assertion fails saying so."""
    assert condition, f"the model no longer agrees: {what}"
    return ""


# --- the claims -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    file: str
    text: str
    """The sentence as the file has it, `{name}` where a value of the model goes."""
    values: Callable[[], dict[str, str]]
    """The model's values (`holds` inside checks what the sentence says besides)."""
    wrong: str = ""
    """Why the file says otherwise than the model today (a file this table's owners may
    not edit): the claim is an expected failure, strict, until the prose is fixed."""

    def render(self) -> str:
        return _norm(self.text.format(**self.values()))


def _mlp() -> dict[str, str]:
    fused = simulate("megatron_mlp", "fused")["summary"]
    best = first("megatron_mlp")
    return {
        "base": t(fused["baseline_s"]),
        "fused": t(fused["makespan_s"]),
        "fused_x": x(fused["speedup"]),
        "best": t(best["time_s"]),
        "best_x": x(best["speedup"]),
        "v": holds(
            best["block"] == "ol_mm_ar_c" and fused["speedup"] > 1,
            "megatron_mlp: fused wins, ol_mm_ar_c ranks first on h100-dgx",
        ),
    }


def _mlp_a100() -> dict[str, str]:
    fused = speedup("megatron_mlp", "fused", "a100-dgx")
    ol = speedup("megatron_mlp", "ol_mm_ar_c", "a100-dgx")
    return {
        "fused_x": x(fused),
        "ol_x": x(ol),
        "v": holds(fused > ol > 1, "megatron_mlp on a100-dgx: fused ahead of ol_mm_ar_c"),
    }


def _one_algorithm() -> dict[str, str]:
    ar = algorithms("megatron_mlp")
    halves = algorithms("megatron_mlp", "mm_rs_c_ag")
    assert len(ar) == 1 and ar == halves, (ar, halves)
    return {"algo": next(iter(ar))}


def _adam() -> dict[str, str]:
    s = simulate("adam", "fused")["summary"]
    return {"base": t(s["baseline_s"]), "after": t(s["makespan_s"]), "x": x(s["speedup"])}


def _sp_block(hw: str) -> Callable[[], dict[str, str]]:
    def values() -> dict[str, str]:
        return {
            b: x(speedup("megatron_sp_block", b, hw), "x")
            for b in ("fused", "shard_overlap", "fused_shard_overlap")
        }

    return values


def _bound(name: str, block: str) -> str:
    """The perfect-overlap bound of a sample's block, the same on h100-dgx and h200-hgx."""
    from test_sim_decompose import speedups_and_bounds

    from cocoviz.ir.lower import load_file
    from cocoviz.sim.hardware import load_profile

    program = load_file(samples.path(name))
    found = {x(speedups_and_bounds(program, load_profile(hw))[block][1], "x") for hw in HOPPER}
    assert len(found) == 1, found
    return found.pop()


HOPPER = ("h100-dgx", "h200-hgx")

SP_BLOCKS = ("shard_overlap", "fused_shard_overlap")

CLAIMS: list[Claim] = [
    # README.md, "A five-minute tour"
    Claim(
        "README.md",
        "There adam's `fused` schedule (CoCoNet's RS-C-AG in one collective) wins, "
        "{base} → {after} ({x}).",
        _adam,
    ),
    Claim(
        "README.md",
        "Megatron's `fused` wins too, {base} → {fused} ({fused_x}), but it is not the best "
        "schedule there:{v}",
        _mlp,
    ),
    Claim(
        "README.md",
        "the model runs the allreduce and its two halves with the same algorithm "
        "(`{algo}` in `simulate`'s table)",
        _one_algorithm,
    ),
    Claim(
        "README.md",
        "the overlap of the matmul with the allreduce (`ol_mm_ar_c`, {best}, {best_x}) ranks "
        "first in `cocoviz tune`",
        _mlp,
    ),
    Claim(
        "README.md",
        "On an A100 node `fused` ranks ahead of `ol_mm_ar_c` ({fused_x} against {ol_x}).{v}",
        _mlp_a100,
    ),
    Claim(
        "README.md",
        "out/adam.json # wins;{v}",
        lambda: {"v": holds(speedup("adam", "fused") > 1, "adam fused wins on h100-dgx")},
    ),
    Claim("README.md", "fused # wins {fused_x}, not the best here", _mlp),
    Claim("README.md", "a100-dgx # wins {fused_x}, ahead of ol_mm_ar_c there{v}", _mlp_a100),
    # the samples' comments
    Claim(
        "cocoviz/samples/megatron_mlp.coco",
        "Predicted on h100-dgx: {base} → {best} ({best_x}), the tuner's best there, ahead of "
        "`fused` ({fused_x});",
        _mlp,
    ),
    Claim(
        "cocoviz/samples/megatron_mlp.coco",
        "on a100-dgx `fused` ranks ahead of this one ({fused_x} against {ol_x}).{v}",
        _mlp_a100,
    ),
    *[
        Claim(
            "cocoviz/samples/megatron_sp_block.coco",
            f"{hw}: fused {{fused}}, shard_overlap {{shard_overlap}}, "
            "fused_shard_overlap {fused_shard_overlap}",
            _sp_block(hw),
        )
        for hw in HOPPER
    ],
    Claim(
        "cocoviz/samples/megatron_sp_block.coco",
        "(perfect overlap of every decomposed pair: at most {bound} on either).",
        lambda: {"bound": _bound("megatron_sp_block", "fused_shard_overlap")},
    ),
    Claim(
        "cocoviz/samples/zero3_layer.coco",
        "h100-dgx {h100}, h200-hgx {h200} (perfect overlap: at most {bound}).",
        lambda: {
            "h100": x(speedup("zero3_layer", "shard_overlap", "h100-dgx"), "x"),
            "h200": x(speedup("zero3_layer", "shard_overlap", "h200-hgx"), "x"),
            "bound": _bound("zero3_layer", "shard_overlap"),
        },
    ),
    Claim(
        "cocoviz/samples/moe_routed.coco",
        "Predicted (cocoviz simulate --hw h100-dgx): as written {base}, overlapped {ol} "
        "({ol_x}); cocoviz tune ranks overlapped first.{v}",
        lambda: {
            "base": t(simulate("moe_routed", "as_written")["summary"]["makespan_s"]),
            "ol": t(simulate("moe_routed", "overlapped")["summary"]["makespan_s"]),
            "ol_x": x(speedup("moe_routed", "overlapped"), "x"),
            "v": holds(
                first("moe_routed")["block"] == "overlapped",
                "moe_routed: tune ranks overlapped first on h100-dgx",
            ),
        },
    ),
    Claim(
        "cocoviz/samples/zero1_tp_mlp.coco",
        "h100-dgx {t100}, {h100} over as written, h200-hgx {h200}; cocoviz tune ranks "
        "fused_adam first.{v}",
        lambda: {
            "t100": t(simulate("zero1_tp_mlp", "fused_adam")["summary"]["makespan_s"]),
            "h100": x(speedup("zero1_tp_mlp", "fused_adam", "h100-dgx"), "x"),
            "h200": x(speedup("zero1_tp_mlp", "fused_adam", "h200-hgx"), "x"),
            "v": holds(
                first("zero1_tp_mlp")["block"] == "fused_adam",
                "zero1_tp_mlp: tune ranks fused_adam first on h100-dgx",
            ),
        },
    ),
    # docs/cost-model.md, "Decomposed groups": the samples
    Claim(
        "docs/cost-model.md",
        "predicts {h100_a} (`shard_overlap`) and {h100_b} (`fused_shard_overlap`) on h100-dgx, "
        "{h200_a} and {h200_b} on h200-hgx, under the perfect-overlap bound of {bound}; "
        "`zero3_layer` predicts {z100} and {z200} (bound {zbound}):",
        lambda: {
            "h100_a": x(speedup("megatron_sp_block", "shard_overlap", "h100-dgx")),
            "h100_b": x(speedup("megatron_sp_block", "fused_shard_overlap", "h100-dgx")),
            "h200_a": x(speedup("megatron_sp_block", "shard_overlap", "h200-hgx")),
            "h200_b": x(speedup("megatron_sp_block", "fused_shard_overlap", "h200-hgx")),
            "bound": _bound("megatron_sp_block", "fused_shard_overlap").replace("x", "×"),
            "z100": x(speedup("zero3_layer", "shard_overlap", "h100-dgx")),
            "z200": x(speedup("zero3_layer", "shard_overlap", "h200-hgx")),
            "zbound": _bound("zero3_layer", "shard_overlap").replace("x", "×"),
        },
    ),
]


CONFIG = ("-D", "B=8", "-D", "S=1024", "-D", "H=3072", "--ranks", "16")
"""megatron_mlp at CoCoNet's configuration (its comments), on v100-dgx2."""


def _samples_table() -> dict[str, str]:
    """docs/cost-model.md's table as `python bench/samples_table.py` prints it."""
    import runpy

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(str(ROOT / "bench" / "samples_table.py"), run_name="__main__")
    return {"table": out.getvalue()}


def _first(name: str, label: str) -> str:
    row = first(name)
    assert label in row["name"], (name, row["name"], label)
    return x(row["speedup"])


def _tp_algorithms() -> dict[str, str]:
    algos = algorithms("megatron_mlp") | algorithms("megatron_mlp", "mm_rs_c_ag")
    holds(algos == {"symmetric/Simple"}, f"symmetric/Simple only, got {algos}")
    return {}


def _crossover(name: str, sweep: str, winner: str) -> str:
    found = tune(name, "h100-dgx", "--sweep", sweep)["crossovers"]
    assert found and winner in found[0]["winner"], found
    value = int(found[0]["value"])
    return f"2^{value.bit_length() - 1}"


DOCS_SAMPLES = "docs/cost-model.md"

CLAIMS += [
    Claim(DOCS_SAMPLES, "{table}", _samples_table),
    Claim(
        DOCS_SAMPLES,
        "so `ol(MM, fuse(RS-C-AG))` is the best Megatron schedule there (K = 4 on 16 V100s, {x}).",
        lambda: {
            "x": x(
                first("megatron_mlp", "v100-dgx2", "--collectives", "nccl-device", *CONFIG)[
                    "speedup"
                ]
            ),
            "v": holds(
                first("megatron_mlp", "v100-dgx2", "--collectives", "nccl-device", *CONFIG)["name"]
                == "ol(MM, fuse(RS-C-AG), K=4)",
                "ol(MM, fuse(RS-C-AG), K=4) first at CoCoNet's configuration",
            ),
        },
    ),
    Claim(
        DOCS_SAMPLES,
        "`cocoviz tune` ranks fuse(RS-C-AG) first for adam ({adam}) and sgd ({sgd}),",
        lambda: {
            "adam": _first("adam", "fuse(RS-C-AG)"),
            "sgd": _first("sgd", "fuse(RS-C-AG)"),
        },
    ),
    Claim(
        DOCS_SAMPLES,
        "and for lamb with `norm(w)` computed before the reduce-scatter ({lamb});",
        lambda: {"lamb": _first("lamb", "C-fuse(RS-C-AG)")},
    ),
    Claim(
        DOCS_SAMPLES,
        "puts the crossover from AR-C to fuse(RS-C-AG) at N = {n}.",
        lambda: {"n": _crossover("adam", "N=2^16..2^30", "fuse(RS-C-AG)")},
    ),
    Claim(
        DOCS_SAMPLES,
        "the allreduce and its halves all run as NCCL's symmetric kernels (symmetric/Simple:",
        _tp_algorithms,
    ),
    Claim(
        DOCS_SAMPLES,
        "MM-RS-C-AG alone gains little or nothing ({x} for megatron_mlp)",
        lambda: {"x": x(speedup("megatron_mlp", "mm_rs_c_ag"))},
    ),
    Claim(
        DOCS_SAMPLES,
        "ol(MM, AR, K=4)-C ranks first for megatron_mlp ({mlp}) and megatron_attention_out "
        "({att}), the paper's `ol(MM, fuse(RS-C-AG))` for transformer_block ({tb}).",
        lambda: {
            "mlp": _first("megatron_mlp", "ol(MM, AR, K=4)-C"),
            "att": _first("megatron_attention_out", "ol(MM, AR, K=4)-C"),
            "tb": _first("transformer_block", "ol(MM, fuse(RS-C-AG)"),
        },
    ),
    Claim(
        DOCS_SAMPLES,
        "shows the overlap paying from S = {s} (B = 2)",
        lambda: {"s": _crossover("megatron_mlp", "S=2^3..2^13", "ol(MM, AR")},
    ),
    Claim(
        DOCS_SAMPLES,
        "Sliced sends make the pipeline sample about {about} faster on H100, where its stages "
        "sit on different nodes, and sending each chunk on its own stream while the next is "
        "reduce-scattered (the `fused` schedule) {fused}.",
        lambda: {
            "about": f"{round(speedup('pipeline_stage', 'rs_p2p_c_ag'))}×",
            "fused": f"{speedup('pipeline_stage', 'fused'):.1f}×",
        },
    ),
]


END = ""
"""The end of a file, as the end of a passage."""


@dataclass(frozen=True)
class Elsewhere:
    """A passage whose figures are not the model's predictions of a sample, or are
    checked by another test: from `start` up to `end` (exclusive) in the file's prose."""

    file: str
    start: str
    end: str
    why: str


ELSEWHERE: list[Elsewhere] = [
    Elsewhere(
        "docs/architecture.md",
        "### The terminal UI and large programs",
        "times keys and `q` on a",
        "the TUI's settings and bounds (the switch interval, INLINE_STAGES, cache sizes), "
        "not predictions: tests/test_tui_large.py and test_tui_memory.py check them",
    ),
    Elsewhere(
        "docs/cost-model.md",
        "## Functions",
        "## Decomposed groups",
        "the model's inputs and their sources: NCCL's constants, measured terms, the "
        "figures of nccl-tests, NCCL's tuning.cc and published sweeps it cites, the profile "
        "constants; its tables are checked by test_model_validation.py and "
        "test_collectives_table.py",
    ),
    Elsewhere(
        "docs/cost-model.md",
        "## Decomposed groups",
        "The sample `megatron_sp_block`",
        "tests/programs/seqpar_mlp.coco, not a sample: its table and sweep are "
        "test_sim_decompose.py's",
    ),
    Elsewhere(
        "docs/cost-model.md",
        "writes the whole f32 accumulator.",
        "### Predicted times of the samples",
        "the published comparison (test_sim_decompose.py, "
        "test_published_comparison_in_the_docs_is_the_models_answer), warnings, traces, "
        "the tuner's method and its regions (test_tune_regions.py)",
    ),
    Elsewhere(
        "docs/cost-model.md",
        "each NCCL call's latency matters:",
        "so `ol(MM, fuse(RS-C-AG))` is the best",
        "the model's rule in words; the prediction it leads to is the claim after it",
    ),
    Elsewhere(
        "docs/cost-model.md",
        "### Benchmarks",
        END,
        "benchmarks (bench/, timed, not predicted) and the simulator's limits",
    ),
    Elsewhere(
        "docs/codegen.md",
        "# Code generation",
        END,
        "what the emitted code does (NVLS is NCCL's multimem path it may take) and how "
        "fast the emulation runs, not the model's predictions",
    ),
]


# --- the prose -----------------------------------------------------------------------------------

FENCE = re.compile(r"^( *)```([\w-]*)\n(.*?)^\1```\n", re.M | re.S)

CLAIM_WORDS = re.compile(
    r"\d+(?:\.\d+)?\s?(?:µs|ms)\b"  # a time
    r"|\d+\.\d+\s?[x×]"  # a speedup
    r"|\d+\s?GB/s"  # a bandwidth
    r"|\bNVLS\b|NVLink SHARP"  # an algorithm (`ring` describes too much else)
    r"|\bwins\b|\bloses\b|\bfaster\b|\bslower\b"  # a verdict
)


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _markdown_prose(text: str) -> str:
    """A markdown file's prose: outputs and programs left out (test_readme.py compares
    them), shell commands as their comments after the command (`# wins 1.16×`)."""

    def block(m: re.Match[str]) -> str:
        if m[2] != "sh":
            return "\n"
        lines = []
        for line in m[3].splitlines():
            cmd, _, comment = line.partition("  # ")
            if comment:
                lines.append(f"{cmd.split()[-1] if cmd.split() else ''} # {comment}")
        return "\n".join(lines) + "\n"

    return _norm(FENCE.sub(block, text))


def _coco_prose(text: str) -> str:
    """A sample's comments: its whole-line comments, without the `#`."""
    lines = [ln.strip()[1:] for ln in text.splitlines() if ln.strip().startswith("#")]
    return _norm(" ".join(lines))


def prose_files() -> list[tuple[str, str]]:
    out = [("README.md", _markdown_prose((ROOT / "README.md").read_text()))]
    for path in sorted((ROOT / "docs").glob("*.md")):
        out.append((f"docs/{path.name}", _markdown_prose(path.read_text())))
    for name in samples.names():
        out.append((f"cocoviz/samples/{name}.coco", _coco_prose(samples.text(name))))
    return out


def claim_hits(text: str) -> list[re.Match[str]]:
    return list(CLAIM_WORDS.finditer(text))


def _claims_param() -> list[object]:
    return [
        pytest.param(c, marks=pytest.mark.xfail(reason=c.wrong, strict=True)) if c.wrong else c
        for c in CLAIMS
    ]


@pytest.mark.parametrize("claim", _claims_param(), ids=lambda c: f"{c.file}:{c.text[:40]}")
def test_the_claim_is_the_models(claim: Claim) -> None:
    prose = dict(prose_files())[claim.file]
    rendered = claim.render()
    assert rendered in prose, f"{claim.file} should say, from the model:\n{rendered}"


def _spans(file: str, prose: str) -> list[tuple[int, int]]:
    """Where the prose of `file` is a claim of the table (as written there, unfilled
    values matched loosely) or a passage of ELSEWHERE."""
    spans = []
    for c in CLAIMS:
        if c.file != file:
            continue
        try:
            pattern = re.escape(c.render())
        except AssertionError:
            pattern = ""
        if not pattern or not re.search(pattern, prose):
            # The model disagrees (test_the_claim_is_the_models says so): the sentence
            # with any values in their places.
            parts = [re.escape(_norm(p)) for p in re.split(r"\{\w+\}", c.text)]
            pattern = r".{0,40}?".join(parts)
        for m in re.finditer(pattern, prose):
            spans.append(m.span())
    for e in ELSEWHERE:
        if e.file != file:
            continue
        start = prose.find(_norm(e.start))
        assert start >= 0, (file, e.start)
        end = len(prose) if e.end == END else prose.find(_norm(e.end), start)
        assert end >= 0, (file, e.end)
        spans.append((start, end))
    return spans


def test_every_claim_in_the_prose_is_in_the_table() -> None:
    missing = []
    for file, prose in prose_files():
        spans = _spans(file, prose)
        for hit in claim_hits(prose):
            if not any(a <= hit.start() and hit.end() <= b for a, b in spans):
                context = prose[max(0, hit.start() - 70) : hit.end() + 30]
                missing.append(f"{file}: …{context}…")
    assert not missing, "claims no test evaluates (add them to CLAIMS):\n" + "\n".join(missing)
