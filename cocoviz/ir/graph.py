"""Graph queries over a Program: producers, users, ordering edges, groups, convexity,
and the JSON and Graphviz forms of the dataflow graph."""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from cocoviz.ir.nodes import (
    COLLECTIVES,
    REDUCTIONS,
    Expr,
    Group,
    GroupKind,
    Op,
    Program,
    Stage,
    expr_reads,
)
from cocoviz.ir.types import format_shape, layouts_text
from cocoviz.style import kind_fill


def stage_reads(s: Stage) -> frozenset[str]:
    """Names (inputs, params, stages) a stage's expression reads (cached on it)."""
    return expr_reads(s.expr)


def data_deps(program: Program) -> dict[str, set[str]]:
    """Stage → the stages it reads (data edges only)."""
    names = {s.name for s in program.stages}
    return {s.name: names & stage_reads(s) for s in program.stages}


def deps(program: Program) -> dict[str, set[str]]:
    """Stage → the stages that must run before it: data edges plus the ordering edges of
    `update` (every other read of an updated input runs before the write)."""
    return dataflow(program)[0]


def users(program: Program) -> dict[str, list[str]]:
    """Name → stages that read it, in program order."""
    out: dict[str, list[str]] = {}
    for s in program.stages:
        for r in sorted(stage_reads(s)):
            out.setdefault(r, []).append(s.name)
    return out


def dataflow(program: Program) -> tuple[dict[str, set[str]], dict[str, list[str]]]:
    """`deps` and `users` (each name's list in program order) in one pass over the
    stages; the ordering edges of an update come from the users of its target."""
    stages = program.stages
    names = {s.name for s in stages}
    before: dict[str, set[str]] = {}
    read_by: dict[str, list[str]] = {}
    for s in stages:
        reads = expr_reads(s.expr)
        before[s.name] = names & reads
        for r in reads:
            found = read_by.get(r)
            if found is None:
                read_by[r] = [s.name]
            else:
                found.append(s.name)
    for t, u in program.updates().items():
        before[u].update(n for n in read_by.get(t, ()) if n != u)
    return before, read_by


def successors(program: Program) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {s.name: set() for s in program.stages}
    for n, ds in deps(program).items():
        for d in ds:
            out[d].add(n)
    return out


def reachable(succ: dict[str, set[str]], start: Iterable[str]) -> set[str]:
    seen: set[str] = set()
    todo = list(start)
    while todo:
        n = todo.pop()
        for m in succ.get(n, ()):
            if m not in seen:
                seen.add(m)
                todo.append(m)
    return seen


def convex_hull(program: Program, names: Iterable[str]) -> set[str]:
    """The smallest convex set holding `names`: every stage on a path between two members."""
    members = set(names)
    succ = successors(program)
    pred: dict[str, set[str]] = {n: set() for n in succ}
    for n, ss in succ.items():
        for m in ss:
            pred[m].add(n)
    down = reachable(succ, members)
    up = reachable(pred, members)
    return members | (down & up)


def contracted_order(
    program: Program, groups: Iterable[Group], edges: dict[str, set[str]] | None = None
) -> list[str | Group] | None:
    """Stages and groups in a topological order of the graph with each group contracted
    to one node (stable by program order); None if that graph has a cycle. `edges` is
    `deps(program)` when the caller has it already."""
    groups = list(groups)
    index = {s.name: i for i, s in enumerate(program.stages)}
    edges = deps(program) if edges is None else edges
    owner: dict[str, int] = {}
    for gi, g in enumerate(groups):
        for n in g.stages():
            owner[n] = gi
    node_of = {n: (f"#{owner[n]}" if n in owner else n) for n in index} if owner else None
    first: dict[str, int] = {}
    for n, i in index.items():
        k = n if node_of is None else node_of[n]
        if k not in first:
            first[k] = i  # `index` is in program order: the first member comes first
    # The nodes by their first member (program order) are usually a topological order
    # already; it is then the order the heap below yields (the ready node with the
    # smallest first index is always the next one), found in one pass over the edges.
    rank = {k: r for r, k in enumerate(first)}
    if node_of is None:
        in_order = all(rank[d] < rank[n] for n, ds in edges.items() for d in ds)
    else:
        in_order = all(
            rank[node_of[d]] < rank[node_of[n]]
            for n, ds in edges.items()
            for d in ds
            if node_of[d] != node_of[n]
        )
    if in_order:
        return [groups[int(k[1:])] if k.startswith("#") else k for k in first]
    if node_of is None:
        node_of = {n: n for n in index}
    indeg: dict[str, int] = {k: 0 for k in first}
    out: dict[str, set[str]] = {k: set() for k in first}
    for n, ds in edges.items():
        for d in ds:
            a, b = node_of[d], node_of[n]
            if a != b and b not in out[a]:
                out[a].add(b)
                indeg[b] += 1
    heap = [(first[k], k) for k, v in indeg.items() if v == 0]
    heapq.heapify(heap)
    order: list[str | Group] = []
    while heap:
        _, k = heapq.heappop(heap)
        order.append(groups[int(k[1:])] if k.startswith("#") else k)
        for m in sorted(out[k]):
            indeg[m] -= 1
            if indeg[m] == 0:
                heapq.heappush(heap, (first[m], m))
    if len(order) != len(first):
        return None
    return order


def ordered_items(program: Program) -> list[str | Group]:
    order = contracted_order(program, program.groups)
    if order is None:  # an invariant failure; print in program order rather than crash
        return [s.name for s in program.stages]
    return order


def implicit_reductions(program: Program) -> list[tuple[str, Expr]]:
    """(stage, reduction expr) for every reduction of a sliced value: these run as a small
    cross-rank collective, shown as `<stage>.reduce` in the graph, timeline and manifest."""
    out: list[tuple[str, Expr]] = []
    for s in program.stages:
        out.extend((s.name, e) for e in stage_reductions(s))
    return out


def stage_reductions(s: Stage) -> tuple[Expr, ...]:
    """The reductions of sliced values in a stage (`implicit_reductions`), cached on its
    expression as its reads are (`nodes.expr_reads`)."""
    d = s.expr.__dict__
    found: tuple[Expr, ...] | None = d.get(_REDUCTIONS_ATTR)
    if found is None:
        found = d[_REDUCTIONS_ATTR] = _sliced_reductions(s.expr)
    return found


def _sliced_reductions(e: Expr) -> tuple[Expr, ...]:
    """`stage_reductions` uncached: the nodes in `Expr.walk`'s pre-order, in one loop
    (the generator costs a resumption per node)."""
    found: list[Expr] = []
    todo = [e]
    while todo:
        x = todo.pop()
        if x.args:
            if x.op in REDUCTIONS and x.args[0].type.layout.is_sliced:
                found.append(x)
            todo.extend(reversed(x.args))
    return tuple(found)


_REDUCTIONS_ATTR = "_cocoviz_sliced_reductions"


def reduce_name(stage: str, k: int) -> str:
    return f"{stage}.reduce" if k == 0 else f"{stage}.reduce{k + 1}"


def op_kind(stage: Stage) -> str:
    """What a stage computes: ``collective``, ``matmul`` or ``compute``."""
    if stage.expr.op in COLLECTIVES:
        return "collective"
    if stage.expr.op is Op.MATMUL:
        return "matmul"
    return "compute"


def node_kind(program: Program, name: str) -> str:
    """The kind a graph view colours stage `name` by: its group's kind (``fused``,
    ``overlapped``) when it is in one, else `op_kind`."""
    g = program.group_of(name)
    if g is not None:
        return g.kind.value
    return op_kind(program.stage(name))


def _dot_id(name: str) -> str:
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_dot(program: Program) -> str:
    """Graphviz dot: inputs as ellipses, stages as boxes coloured by kind, groups as
    clusters, ordering edges dashed."""
    lines = [
        f"digraph {_dot_id(program.name)} {{",
        "  rankdir=TB;",
        '  node [fontname="monospace"];',
    ]
    for i in program.inputs:
        t = i.ty
        label = f"{i.name}\\n{t.dtype.value}{format_shape(t.shape)}\\n{layouts_text(t)}"
        lines.append(f'  {_dot_id(i.name)} [shape=ellipse, label="{label}"];')

    def node(name: str, indent: str) -> None:
        s = program.stage(name)
        t = s.ty
        over = " over dp" if s.expr.tag == "dp" and s.expr.op in COLLECTIVES else ""
        label = (
            f"{name} = {s.expr.op.value}{over}\\n{t.dtype.value}{format_shape(t.shape)}"
            f"\\n{layouts_text(t)}"
        )
        color = kind_fill(op_kind(s))
        lines.append(
            f'{indent}{_dot_id(name)} [shape=box, style=filled, fillcolor="{color}", label="{label}"];'
        )

    counter = [0]

    def cluster(g: Group, indent: str) -> None:
        counter[0] += 1
        lines.append(f"{indent}subgraph cluster_{counter[0]} {{")
        kw = "shards" if g.by_shard else "chunks"
        chunks = f" {kw}={g.chunks}" if g.kind is GroupKind.OVERLAPPED else ""
        lines.append(
            f'{indent}  label="{g.kind.value}{chunks}"; style=filled; color="{kind_fill(g.kind.value)}";'
        )
        for it in g.items:
            if isinstance(it, Group):
                cluster(it, indent + "  ")
            else:
                node(it, indent + "  ")
        lines.append(f"{indent}}}")

    for item in ordered_items(program):
        if isinstance(item, Group):
            cluster(item, "  ")
        else:
            node(item, "  ")
    d = deps(program)
    for s in program.stages:
        for r in sorted(stage_reads(s)):
            if any(p.name == r for p in program.params):
                continue
            lines.append(f"  {_dot_id(r)} -> {_dot_id(s.name)};")
        for o in sorted(d[s.name] - stage_reads(s)):
            lines.append(f"  {_dot_id(o)} -> {_dot_id(s.name)} [style=dashed];")
    for o in program.outputs:
        lines.append(f'  {_dot_id("out:" + o)} [shape=plaintext, label="output {o}"];')
        lines.append(f"  {_dot_id(o)} -> {_dot_id('out:' + o)};")
    lines.append("}")
    return "\n".join(lines) + "\n"
